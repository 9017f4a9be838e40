"""pytest plugin of the conformance suite (registered through ``pytest11``)."""
