from hpc_train.cli import main

raise SystemExit(main())
