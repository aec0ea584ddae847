from perflab.app import main

main()
