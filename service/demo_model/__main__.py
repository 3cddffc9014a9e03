"""`python -m service.demo_model [--models-dir DIR] [--force]`: build millm-tiny."""

from service.demo_model.build import main

raise SystemExit(main())
