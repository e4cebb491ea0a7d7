"""Reviews: the AdmissionReview parsed once into typed models (the Pod's shape included), and the JSON
patch between two objects. Pure: nothing here decides, watches or serves."""
