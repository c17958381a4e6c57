"""The link to a host: the connection (SSH or local), the kept connection and its keeper, the framing of
replies, the typed client of the host agent, and the Host that holds them for one process."""
