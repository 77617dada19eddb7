"""`python -m services.executor --agent ENDPOINT --executor-id ID --framework-id F --work-dir DIR
--runtime docker|process`: one executor process (the agent usually forks it from its launcher)."""

import sys

from services.executor.shell import main

if __name__ == "__main__":
    sys.exit(main())
