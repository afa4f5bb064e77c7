"""`python -m hpcrl`: the same CLI as the `hpcrl` command."""

from hpcrl.cli import entry

if __name__ == "__main__":
    entry()
