from edge.cli.main import main

raise SystemExit(main())
