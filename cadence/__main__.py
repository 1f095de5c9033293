from cadence.cli import main

raise SystemExit(main())
