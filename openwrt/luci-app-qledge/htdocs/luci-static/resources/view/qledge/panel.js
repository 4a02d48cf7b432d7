'use strict';
'require view';
'require rpc';
'require uci';

// Services → qledge: whether the daemon and its web panel run, and a way into the panel.
// The panel signs people in with their own API token; LuCI's login grants nothing there.

var callServiceList = rpc.declare({
	object: 'service',
	method: 'list',
	params: [ 'name' ],
	expect: { '': {} }
});

function running(services, name) {
	var instances = (services[name] || {}).instances || {};
	return Object.keys(instances).some(function(key) { return instances[key].running; });
}

return view.extend({
	load: function() {
		return Promise.all([ callServiceList('qledge'), callServiceList('qledge-web'), uci.load('qledge-web') ]);
	},

	render: function(data) {
		var daemon = running(data[0], 'qledge');
		var panel = running(data[1], 'qledge-web');
		var listen = uci.get('qledge-web', 'main', 'listen') || '127.0.0.1';
		var port = uci.get('qledge-web', 'main', 'port') || '5700';
		var tls = !!uci.get('qledge-web', 'main', 'tls_cert');
		// Behind a reverse proxy the panel is where `origin` says (scheme://host[:port]), not on its port.
		var origin = (uci.get('qledge-web', 'main', 'origin') || '').replace(/\/+$/, '');
		var url = origin ? origin + '/' : (tls ? 'https://' : 'http://') + window.location.hostname + ':' + port + '/';
		var loopback = !origin && (listen.indexOf('127.') === 0 || listen === 'localhost' || listen === '::1');
		var rows = [
			E('p', {}, [ E('strong', {}, _('Daemon')), ': ', daemon ? _('running') : _('not running') ]),
			E('p', {}, [ E('strong', {}, _('Web panel')), ': ', panel ? _('running') : _('not running') ])
		];
		if (!panel)
			rows.push(E('p', {}, _('Start it with: uci set qledge-web.main.enabled=1; uci commit qledge-web; /etc/init.d/qledge-web start')));
		else if (loopback)
			rows.push(E('p', {}, _('The panel listens on this router only: set qledge-web.main.listen to 0.0.0.0 (with tls_cert and tls_key), or qledge-web.main.origin to the address of a reverse proxy in front of it, to open it from here.')));
		else
			rows.push(E('p', {}, E('a', { 'class': 'btn cbi-button cbi-button-action', 'href': url, 'target': '_blank',
				'rel': 'noopener noreferrer' }, _('Open the qledge panel'))));
		return E('div', { 'class': 'cbi-map' }, [
			E('h2', {}, 'qledge'),
			E('div', { 'class': 'cbi-map-descr' }, _('Scheduled tasks, their runs and live logs, in the qledge panel.')),
			E('div', { 'class': 'cbi-section' }, rows)
		]);
	},

	handleSave: null,
	handleSaveApply: null,
	handleReset: null
});
