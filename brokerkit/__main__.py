"""``python -m brokerkit``: the ``brokerkit`` command, for when the console script is elsewhere."""

from brokerkit._cli import main

if __name__ == "__main__":
    main(prog_name="brokerkit")
