"""``python -m pagedattn``: the same as the ``pagedattn`` console command."""

import sys

from pagedattn.cli import main

sys.exit(main())
