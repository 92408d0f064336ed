from fp4lab.cli import main

raise SystemExit(main())
