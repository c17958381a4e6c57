from .. import exitcodes
from .cli import main

if __name__ == "__main__":
    exitcodes.run("capture", main)
