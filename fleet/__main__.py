from fleet.console import main

main()
