// The bindings: named in the document.
