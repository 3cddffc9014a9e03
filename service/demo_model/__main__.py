"""`python -m service.demo_model [--models-dir DIR] [--force]`: build millm-tiny
and its GGUF export, millm-tiny-gguf."""

from service.demo_model.build import main

raise SystemExit(main())
