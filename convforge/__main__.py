from convforge.cli import main

raise SystemExit(main())
