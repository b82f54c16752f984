"""spkflow: an ESPnet-style recipe toolkit for speaker embedders.

Modules do one thing each and import nothing heavy at package import time.
"""

__version__ = "0.1.0"
