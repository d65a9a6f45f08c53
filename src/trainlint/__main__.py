import sys

from trainlint.cli import main

sys.exit(main())
