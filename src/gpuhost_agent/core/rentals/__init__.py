"""Rentals over time: their end dates and clock, and the usage they are billed for."""
