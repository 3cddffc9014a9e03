"""`python -m service.demo_model [--models-dir DIR] [--force] [--train [--seed N] [--ship]]`:
install millm-tiny, its SAEs and its GGUF export (make.py)."""

from service.demo_model.make import main

raise SystemExit(main())
