"""``python -m icefloe`` runs the ``icefloe`` command."""

from icefloe.cli import main

main()
