// The store: named in the document.
