"""One module per page; each calls dash.register_page and defines `layout(**kwargs)`."""
