"""python -m kiln COMMAND: the client's tools.

    python -m kiln minify --accuracy FILE [--server=HOST:PORT] -o DIR
"""

import sys


def main(argv):
    if len(argv) >= 1 and argv[0] == "minify":
        from kiln.minify import main as minify
        return minify(argv[1:])
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
