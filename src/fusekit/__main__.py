"""``python -m fusekit`` runs the CLI."""

from fusekit.cli import main

main()
