import sys

from workloads.submit.cli import main

sys.exit(main())
