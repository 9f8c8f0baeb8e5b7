import sys

from .cli import generic_main

sys.exit(generic_main())
