import sys

from chronomem.bench.command import main

sys.exit(main())
