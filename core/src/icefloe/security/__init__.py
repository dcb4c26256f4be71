"""Who may connect: SASL users and their credentials, and the SASL exchanges that check them."""
