"""`python -m services.cli` is `offerbus`."""

import sys

from services.cli.main import main

sys.exit(main())
