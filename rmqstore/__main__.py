"""``python -m rmqstore``: the command line."""

from rmqstore.commands.main import main

main()
