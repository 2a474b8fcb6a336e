"""``python -m genai``: the command line."""

import sys

from genai.cli import main

sys.exit(main())
