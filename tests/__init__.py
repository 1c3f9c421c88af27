"""The test suite, in folders mirroring the packages."""
