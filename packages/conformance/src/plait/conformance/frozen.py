"""The last module the rank pools' fork server imports: it freezes what the others made.

The fork server imports the worker and the strategy's modules once, and every rank
is forked from it. ``gc.freeze()`` moves every object the server holds then into the
collector's permanent generation, so that no rank's collections scan them again: with
torch imported, each full collection over them costs a rank most of a second of CPU.
Importing this module does that, and nothing else.
"""

from __future__ import annotations

import gc

gc.freeze()
