"""``python -m perdure``: the command line."""

from perdure.cli import main

if __name__ == "__main__":
    main()
