"""The ``rmqstore`` command line: thin click commands over the engine (installed as
``rmqstore.commands``)."""
