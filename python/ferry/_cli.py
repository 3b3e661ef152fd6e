"""The `ferry` console script of a pip install: runs the real C command
(src/cli, linked by setup.py into ferry/_bin/ferry) with the same arguments."""
import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "ferry")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"ferry: {exe} is missing: this installation was built without the C command "
                         "(reinstall with `pip install .`, or build it with `make cli`)\n")
        sys.exit(1)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
