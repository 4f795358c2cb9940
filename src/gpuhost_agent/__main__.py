from gpuhost_agent.service.cli import main

raise SystemExit(main())
