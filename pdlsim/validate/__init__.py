"""``pdlsim validate``: real training runs against predictions from a frozen profile."""
