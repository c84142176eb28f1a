"""What each console page shows, read from the cluster: blocking functions returning plain
values (dataclasses), one module per page family. Nothing here knows about HTTP."""
