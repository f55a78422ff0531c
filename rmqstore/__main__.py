"""``python -m rmqstore``: the command line."""

from rmqstore.commands.entry import main

if __name__ == "__main__":  # not when a worker process imports it (spawn)
    main()
