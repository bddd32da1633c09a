"""secure AFL as a Flower app: one round of this project's protocol over Flower's transport.

Flower only carries messages here. Every decision is the library's: hospitals'
ClientApps protect and sign exactly as the native client does, the ServerApp
runs the native server's state machine (validation, running sum, audit log,
signed receipts and manifest) and the key holder's ClientApp runs the native
finalize. A SuperNode's Flower identity is never trusted: a party is whoever
signed the statement it sends, checked against the consortium PKI.

The Flower project file (for ``flwr run``) is ``flower/project/``.
"""

from .records import PROJECT_DIR

__all__ = ["PROJECT_DIR"]
