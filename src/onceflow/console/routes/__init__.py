"""The console's HTTP routes, one module per page family; each exports `ROUTES`."""
