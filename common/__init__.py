"""Code both processes run: the engine (`service/`) and the REST bridge
(`rest_bridge/`). The bridge is stateless and never imports the engine
package, so whatever the two must agree on (how an API key is identified and
scoped) lives here. Nothing here imports torch or the model stack."""
