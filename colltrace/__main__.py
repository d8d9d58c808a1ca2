import sys

from colltrace.cli import main

sys.exit(main())
