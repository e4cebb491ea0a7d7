// Swagger UI on the timekeeper's own OpenAPI document: a file, as the page's CSP allows no inline script.
window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui" });
