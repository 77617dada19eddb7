"""Tests of the offer-broker."""
