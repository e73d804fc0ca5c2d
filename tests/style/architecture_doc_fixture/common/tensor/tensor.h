// Tensors: named in the document.
