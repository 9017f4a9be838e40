"""The ``torch`` backend: gather the blocks, then ``scaled_dot_product_attention``.

Importing this package imports no torch; :mod:`.backend` imports it inside methods.
"""
