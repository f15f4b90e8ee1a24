"""Importers: files a user gives (CSV prices, availability and lifetime traces, cloud API dumps)
read into the same typed records the collectors yield, for ``spotopt import``."""
