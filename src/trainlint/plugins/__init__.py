"""Third-party rule packs and output formats, through pluggy."""
