"""``python -m pdlsim`` is the same as the ``pdlsim`` command."""

import sys

from pdlsim.cli.main import main

sys.exit(main())
