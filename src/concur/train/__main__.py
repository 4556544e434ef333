"""One process of a multi-GPU launch: `python -m concur.train <launch.json>`."""

from .launch import main

main()
