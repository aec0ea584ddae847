from perflab.app import cli

cli()
