"""Tests of the `offerbus` command line."""
