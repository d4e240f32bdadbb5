// Package nodeclient holds the test of the Node.js example client,
// presence.js: it runs the script as a child process against a whole
// greendot system and checks what it prints. The package has no code of
// its own; the example is the JavaScript next to it (see README.md).
package nodeclient
