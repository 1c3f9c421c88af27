"""The ``pdlsim`` command line: the only argparse and printing in pdlsim."""
