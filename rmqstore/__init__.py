"""rmqstore: read and write Apache RocketMQ message store directories offline.

The engine (this package) holds all file-format logic and never imports click or rich; the
command line lives in :mod:`rmqstore.commands`.
"""

__version__ = "0.1.0"
